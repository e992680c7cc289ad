"""What a run leaves for people to read: OUT/report.html (page.py, with hand-written SVG charts in
svgchart.py) and the live progress line or bar (progress.py, display.py).

The package reads a run's files and knows no Beam: local files are read with os and pyarrow; a
remote output (gs://, s3://) is read through the store dsdata's Beam side registers
(files.register_remote_files), so the launcher and `dsdata report gs://...` still work.
"""
