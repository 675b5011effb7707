"""`make run`'s stack on one machine: Redis, the engine, the console's processes and demo traffic, supervised.

It stands outside the Django package because it starts the whole system, the engine included, as child processes
(`python -m launch`); it imports the console's settings helpers and the solvers, and nothing imports it.
"""
