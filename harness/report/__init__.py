"""What a run produces: the report.json / report.md writer, the HTML page, the console summary,
severity, triage into defects, measures, coverage tables, diff and the xfails ledger.
Imports the catalog and below; never properties' runners, the run layer or engine code.
"""
