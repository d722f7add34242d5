"""The schema owners' HTML report: plots (``figures``) and the self-contained page around them (``page``)."""
