"""Code generation: the loop IR to source text, one printer per language family (c_like.py
and its dialects). Which printer a target uses, and the passes before it, is its backend's
choice: `ansor.backend.generate_source` is the whole way from a program to its text."""
