"""Entity store services, one module per resource; routes call these and nothing else.

No `flask.request` in here. Every read starts from `tenant_select` (org of the token), records
additionally from their definition, so another org's or another entity's object is a 404. Writes
commit here.
"""
