"""attention-labs: a course kit and sandboxed autograder for attention and Transformer labs."""
