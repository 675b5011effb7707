"""Login and logout pages, and the login every page requires."""

import pytest

pytestmark = pytest.mark.django_db

PAGES = ["/", "/frontier/", "/jobs/", "/jobs/new/", "/jobs/1/", "/audit/", "/audit/export/"]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_redirects_an_anonymous_visitor_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={url}"


@pytest.mark.parametrize("url", ["/jobs/1/approve/", "/jobs/1/reject/", "/jobs/1/cancel/", "/jobs/new/"])
def test_an_anonymous_post_is_sent_to_login_and_changes_nothing(client, url):
    response = client.post(url, {"plan_hash": "x", "kind": "cut", "cut": "8,4,4", "action": "propose"})
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_login_page_has_the_standard_fields(client):
    page = client.get("/login/").content.decode()
    assert 'id="id_username"' in page and 'id="id_password"' in page and 'type="submit"' in page


def test_logging_in_opens_the_dashboard_with_the_user_and_role_in_the_nav(client, make_user):
    user = make_user("reviewer", name="rita")
    user.set_password("s3cret-pass")
    user.save()
    response = client.post("/login/", {"username": "rita", "password": "s3cret-pass"})
    assert response.status_code == 302 and response["Location"] == "/"
    page = client.get("/jobs/").content.decode()
    assert '<span data-testid="nav-user">rita</span>' in page
    assert "(reviewer)" in page
    assert 'data-testid="logout-button"' in page


def test_a_wrong_password_is_refused_on_the_form(client, make_user):
    user = make_user("viewer", name="vic")
    user.set_password("right-pass")
    user.save()
    response = client.post("/login/", {"username": "vic", "password": "wrong"})
    assert response.status_code == 200
    assert 'data-testid="form-error"' in response.content.decode()
    assert client.get("/jobs/").status_code == 302


def test_logout_is_a_post_and_ends_the_session(browse, post_form, viewer):
    client = browse(viewer)
    assert client.get("/jobs/").status_code == 200
    response = post_form(client, "/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"
    assert client.get("/jobs/").status_code == 302


def test_a_user_without_a_console_role_gets_403(browse, make_user):
    client = browse(make_user(name="nobody"))
    response = client.get("/jobs/")
    assert response.status_code == 403
    assert "none of the console roles" in response.content.decode()
