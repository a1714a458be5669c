"""Results rendered: the tables of results files as Markdown (tables.py), a
leak report to HTML and a screenshot (screenshot.py)."""
