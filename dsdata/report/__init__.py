"""What a run leaves for people to read: OUT/report.html (page.py, charts in svgchart.py) and the
live progress line or bar (progress.py).  It knows no Beam: a remote output is read through the
store dsdata's Beam side registers (files.register_remote_files).
"""
