"""The account dashboard: server-rendered pages for keys, balance, usage and operators."""
