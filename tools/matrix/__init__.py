"""The parts of ``tools/conformance_matrix.py``, the command that runs the suite against every
implementation and publishes the matrix: :mod:`.run` (the suite in each implementation's
environment), :mod:`.findings` (the findings files and which FAIL cell each explains),
:mod:`.build` (reports and findings into the matrix, and ``--check``'s comparison) and
:mod:`.render` (the matrix as ``docs/conformance-matrix.md``)."""
