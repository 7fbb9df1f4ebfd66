"""The methods: one file each, registered by ``@register("name")`` (``strategies.registry``).

Every module here is a method, so this folder is the registry's rule: a new file is found without an
edit elsewhere, and the base the methods build on (``strategies.base``, its parts and the framework
adapters) lives one level up.
"""
