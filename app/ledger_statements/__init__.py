"""Signed ledger statements: an organisation's chained entries over a period, signed.

A holder checks one without the operator's database (tools/verify_statement.py, the
algorithm in docs/concepts/ledger-statements.md).
"""
