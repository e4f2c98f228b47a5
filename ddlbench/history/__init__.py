"""The results database (SQLite): every sweep and certificate, listed and compared."""
