"""Where samples come from: an image folder (ImageFolder's layout)."""
