"""Pure rendering: plain arrays in, rich Segments / Text out. No textual, no torch."""
