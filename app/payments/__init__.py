"""Payments: orders paid through Stripe, the events that settle them, and redemption codes.

Money only becomes credits here through the ledger's grant (app.credits.grants), named
after the order or the code it came from, in the same transaction as the order's or the
code's change of state.
"""
