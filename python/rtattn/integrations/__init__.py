"""Integrations of rtattn into other libraries (each module imports its library only when used)."""
