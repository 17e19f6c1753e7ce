"""The ledger's SQL statements, built once: each guard and each change of a row written once.

Constructing a statement costs more CPU than executing it (about 0.15 ms each), and a
prebuilt one's cache key is memoized. SQLite runs the guarded UPDATEs one at a time in
a transaction; PostgreSQL runs the same guards and changes as one statement built from
them (``hold_in_one_statement``, ``settlement_in_one_statement``), alone. A hold whose
key and member have no budget reserves on the account alone, and each database has a
statement for it that sets up nothing of the rows' reservations
(``hold_without_reservations``, ``INSERT_HOLD_RESERVING_NOTHING``). The builders take
the guards as arguments, looked up when they are called, so that a test can swap one
for a broken one and watch the invariants catch it. Constants are written into the
statements' text (``constant``); every value sent is a parameter bound once.

No parameter is named like a column of the table a statement updates: SQLAlchemy
would SET every column named by a parameter of the execution.

The statements are grouped as the money API is (app.credits): ``guards`` (the tables,
the guards and the changes every statement is built from), ``holds``, ``settlement``,
``entries`` (the chain), ``expiry`` and ``balances``.
"""
