"""Outgoing HTTP: the webhook sender (issue 16 item 2)."""
