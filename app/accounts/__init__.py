"""Dashboard sign-in for accounts: passwords (Argon2id) and operators' invites."""
