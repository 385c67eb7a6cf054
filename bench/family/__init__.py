"""The parts of ``bench/family_side.py``, the PPO-family ops timed side by side with the libraries:
:mod:`.cases` (shapes, inputs, the case type, ppo-ref's expected values), :mod:`.mine` and one module
per library side (:mod:`.verl`, :mod:`.openrlhf`, :mod:`.skyrl`, :mod:`.trl116`), :mod:`.sides`
(which module builds which side), :mod:`.compare` (the workers and the rounds) and :mod:`.section`
(the ``bench/RESULTS.md`` section)."""
