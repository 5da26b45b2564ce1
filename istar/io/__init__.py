"""Files on disk: atomic writes and content digests recorded at write time, checked at read time.

Also the readers of what the steps write (:mod:`istar.io.results`: a finished run folder, a
measurement file), so that the steps, the report and the pipeline share them.

May import: no other subpackage, only ``istar.__version__`` (the layer contract: :mod:`istar.layers`);
every other layer may import it.
"""
