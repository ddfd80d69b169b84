"""The view layer: what runs now (``observe``'s verdicts plus live figures), and every way of showing it.

Reads only: nothing here changes a state, writes a row or signals a process, and nothing here
decides what runs (``observe`` does). Must not import the public modules (``cli``,
``launcher``, ``demo``), which call into it.
"""
