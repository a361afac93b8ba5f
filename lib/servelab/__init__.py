"""servelab: the reference library of the servelab course on LLM inference serving.

One concept per module (see the book's architecture page for the module map). Every notebook of the
course imports from here, so what a chapter shows is what this code computes.
"""

__version__ = "0.1.0"
