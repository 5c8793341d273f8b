"""Many hosts behind the one host port: where a new sandbox goes (`placement`), and the pool
that routes every call to the host that holds its sandbox or snapshot (`pool`)."""
