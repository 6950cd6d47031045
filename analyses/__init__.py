"""The studies behind the repository's findings: one module per study, each registering itself with
:func:`gpt2_interp.experiments.register`, run by the library's runner (``gpt2-interp run NAME``).

This folder is not part of the installed package: the runner finds it as a study folder (the ``analyses/``
of the checkout, or ``./analyses``) and imports it as the package ``analyses``, so studies import each other
(``from .mass_editing import mean_scores``) and tests import ``analyses.<study>``. Results live in
``analyses/results/<study>/<model>[/<tag>]``; README.md says what each one found.
"""
