"""/docs works offline: the Swagger UI page loads its script and stylesheet from this server."""

import re

import httpx


def test_docs_page_uses_only_local_assets(api):
    page = httpx.get(f"{api.url}/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    urls = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
    urls += re.findall(r"""url:\s*['"]([^'"]+)['"]""", page.text)
    assert urls and not [u for u in urls if u.startswith(("http://", "https://", "//"))]
    for path in urls:
        got = httpx.get(f"{api.url}{path}")
        assert got.status_code == 200 and len(got.content) > 0, path
    assert any(u.endswith("swagger-ui-bundle.js") for u in urls)
    assert any(u == "/openapi.json" for u in urls)
