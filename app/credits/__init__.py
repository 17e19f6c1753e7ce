"""Money: prices, balances, holds and the ledger."""
