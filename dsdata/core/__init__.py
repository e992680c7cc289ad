"""The ground floor: small helpers that several packages share (how paths are shown in messages and
read back, the terminal progress display).  Nothing here imports another dsdata package, so every
package may import it (tests/test_structure.py holds the layering)."""
