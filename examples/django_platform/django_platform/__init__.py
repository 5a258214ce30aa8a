"""An example Django platform with the library installed (``reconcile.contrib.django``)."""
