"""Images of vision-language data: where they are, their size from the header, and the processor's token rule."""
