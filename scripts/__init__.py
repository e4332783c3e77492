"""Developer scripts (not shipped): generators whose output is committed."""
