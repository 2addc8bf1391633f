"""How gpuload writes counts, sizes in bytes and image sizes for a person, the same in every message.

Image sizes are written width x height (``640x480`` is landscape), as photo tools write them
(Pillow's ``Image.size``, ffmpeg, ``file``); tensor shapes stay ``[3, H, W]``, torch's order, in brackets.
"""

from __future__ import annotations

__all__ = ["byte_size", "count", "either", "image_size"]


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``number`` and ``noun``, the noun in the plural unless ``number`` is 1.

    Example:
        >>> count(1, "image"), count(0, "image"), count(2, "class", "classes"), count(1_281_167, "image")
        ('1 image', '0 images', '2 classes', '1,281,167 images')
    """
    return f"{number:,} {noun if number == 1 else plural or noun + 's'}"


def either(number: int, one: str, many: str) -> str:
    """``one`` when ``number`` is 1, else ``many``: the words that agree with a count.

    Example:
        >>> f"{count(1, 'image')} {either(1, 'does not match its', 'do not match their')} checksum"
        '1 image does not match its checksum'
    """
    return one if number == 1 else many


def byte_size(number: int | float) -> str:
    """A number of bytes in the decimal unit that keeps it readable (``KB``, ``MB``, ``GB``, ``TB``).

    Example:
        >>> byte_size(1), byte_size(999), byte_size(48_900), byte_size(97_700_000), byte_size(1_843_200_000)
        ('1 byte', '999 bytes', '48.9 KB', '97.7 MB', '1.84 GB')
    """
    if number < 1000:
        return count(int(number), "byte")
    for unit, scale in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if number < 1000 * scale:
            value = number / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{number / 1e12:,.2f} TB"


def image_size(height: int, width: int) -> str:
    """An image's size as photo tools write it, width x height.

    Example:
        >>> image_size(480, 640)  # a landscape photo, (height, width) in torch's order
        '640x480'
    """
    return f"{width}x{height}"
