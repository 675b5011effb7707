"""The driver and what changes it: the control loop over the ranks, reconfiguration operations, recovery from a
failed step, health, the control-side state on disk (spent job ids, witnessed audit heads) and the state replies."""
