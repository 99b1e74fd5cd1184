"""Background jobs: one module per job family; plain functions that take ids and record their runs."""
