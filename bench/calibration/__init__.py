"""Refitting the twin's step costs to AIConfigurator (``make calibrate``; docs/calibration.md)."""
