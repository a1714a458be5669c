"""Recorded training loops (*.mtrace.gz) for replay on the host backend, and
their recorder (record.py); README.md says what each trace is."""
