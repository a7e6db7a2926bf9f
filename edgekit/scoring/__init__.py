"""Scoring: metrics, answers scored against gold, agreement, confidence calibration and out-of-scope scores. No
torch: a scoring tool loads no training code."""
