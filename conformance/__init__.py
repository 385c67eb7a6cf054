"""The conformance suite: ppo-ref's specification (``spec/``) run against any PPO implementation."""
