"""Money: prices, balances, holds and the ledger.

The invariants: an account's ``balance`` equals the sum of its ledger entries; its
``reserved`` equals the sum of its open holds; ``balance - reserved`` never goes below
zero. Every change to a balance is a conditional UPDATE plus a ledger INSERT committed
together, so concurrent requests cannot overspend and no charge is lost or doubled.

The money API, by what a reader looks for: ``grants`` (credit in), ``holds`` (a
request's worst case set aside), ``settlement`` (the hold replaced by its charge),
``expiry`` (holds renewed, released or voided), ``balances`` (the money read back),
``entries``, ``chain`` and ``chain_audit`` (the hash-chained ledger), and ``sql``, the
statements they run.
"""
