"""The ``sa2va-rl`` command line: ``main.py`` holds the table of user commands; ``sa2va-rl --help`` lists them."""
