"""How samples are written: decoded, re-encoded, into a dataset's files."""
