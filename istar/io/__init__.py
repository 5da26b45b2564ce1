"""Files on disk: atomic writes and content digests recorded at write time, checked at read time.

Layer 0: imports nothing of ``istar``; every other layer may use it.
"""
