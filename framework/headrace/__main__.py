"""``python -m headrace``: the ``headrace`` command.

``headrace run --workers N`` starts its workers this way, with the interpreter it runs on
(``sys.executable``): no dependence on where the ``headrace`` script was installed, or on PATH.
"""

from headrace.cli import main

if __name__ == "__main__":
    main()
