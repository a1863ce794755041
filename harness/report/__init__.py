"""What a run produces: the report.json / report.md writer, the HTML page, the console summary,
severity, triage into defects, measures, coverage tables, diff, the xfails ledger and explain (a defect
as upstream text with a standalone reproducer script that imports only torch and the engine).
Imports the catalog and below; never properties' runners, the run layer or engine code.
"""
