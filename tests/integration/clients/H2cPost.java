import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

/** POSTs argument 2 to URL argument 1 with Java's own HTTP client at its defaults (HTTP/2
 * preferred: on an http:// URL it asks the server for an h2c upgrade); prints the status line
 * and the body. */
public class H2cPost {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newHttpClient();
        HttpRequest request = HttpRequest.newBuilder(URI.create(args[0]))
            .header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(args[1]))
            .build();
        HttpResponse<String> response = client.send(request, HttpResponse.BodyHandlers.ofString());
        System.out.println(response.version() + " " + response.statusCode());
        System.out.println(response.body());
    }
}
