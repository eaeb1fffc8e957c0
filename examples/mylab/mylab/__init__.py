"""mylab: an example of a user's own model and data for the runner (see ../README.md)."""
