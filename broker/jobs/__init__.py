"""Jobs: pure transitions (``transitions``, ``updates``) and recovery policies
(``recovery``) decide; the ``applier`` writes and sends; ``ops`` is what servicers and
the scheduler call. See docs/architecture.md."""
