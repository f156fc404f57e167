"""The web console of ``agents-stream ui``: an index of the ActionState topic kept by a
tailing consumer (``journal.py``), a key's history read from it (``history.py``), the
cluster's lag and dead letters (``cluster.py``), HTML pages (``pages.py``) and the aiohttp
application that serves them (``server.py``)."""
