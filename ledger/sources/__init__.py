"""The sources adapter: pack content and operator files from outside the store (R5).

``files`` reads operator-supplied files and ``local_path`` directories, ``git`` reads
``official_repo`` content at an exact commit, ``resolve`` turns a manifest into
resolved packs. Every failure is an ``InvalidInput`` naming the manifest field
(``packs[i]…``) or the file and field inside ``pack.json``; nothing is written.
"""
