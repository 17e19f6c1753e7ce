"""Alerts: an organisation's events (its balance fell below its threshold) and their delivery."""
