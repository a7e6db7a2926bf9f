"""The build report as people read it: report.md's sections (markdown) and the plots beside it (plots)."""
