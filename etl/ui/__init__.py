"""Terminal output: the shared rich console and progress bars."""
