"""Built-in adapters for third-party PPO implementations (``--impl=trl``, ``verl``, ``openrlhf``,
``torchrl``, ``sb3``, ``skyrl``).

Each module here defines ``make_adapter()``, resolved by name through
:data:`ppo_ref.adapters.registry.BUILTIN_ADAPTERS`. Every adapter imports its library only inside
``make_adapter`` (ppo-ref itself never needs the library) and, when the library is missing, raises
:class:`ppo_ref.adapters.AdapterLoadError` naming the command that builds the library's isolated
environment (``python tools/thirdparty_envs.py NAME``, see ``docs/thirdparty-envs.md``).

An adapter calls the library's own functions and only converts shapes and argument conventions;
it never copies or corrects the library's math, so a real disagreement with the spec shows as a
failure of the conformance suite. Each adapter's ``provenance`` names the library function behind
every op, and its declared ``conventions`` cite the library code that shows them.
"""
