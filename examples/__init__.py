"""Example applications built on dtq (not part of the installed package)."""
