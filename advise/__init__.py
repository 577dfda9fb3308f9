"""``replay-theory optimal``'s application: above the formulas (theory/, core/), below the command line (cli/).

Modules (import the one you need; this package imports nothing itself, so ``optimal`` starts fast):

- ``optimal``        every input ``optimal`` and ``gamma`` take (one field per option, checked once), the objectives
                     table and the answer of each objective as a record with its text
- ``advice``         the default objective's query and answer: the whole design (B, R, N) from theory/forgetting.py,
                     as a record and its text
- ``answer``         the text printed for the paper's design, the noise-scale rule and a GPU split
- ``evidence``       what the prediction benchmark found per objective (``evidence.json``): the evidence and
                     tested lines
- ``profile_files``  profile files (JSON or CSV): read, checked, written, and the ``next:`` line naming them
"""
