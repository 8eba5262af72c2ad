"""placeholder"""
def add_arguments(p): pass
def run(args, console): return 0
