"""Part V's scale-out helpers: several devices in one process (``sharding``) and several processes on
one machine (``launch``). They know no example: what a split PLN fit must match is passed in.
"""
